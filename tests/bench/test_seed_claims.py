"""docs/seed-claims.md is what bench/targets/seed_claims.py prints now: a number of trainfit's that changes makes this fail
until the document is regenerated (python -m bench run seed_claims) and its verdicts re-read."""
from __future__ import annotations



from bench.targets import seed_claims


def test_the_document_matches_a_fresh_run():
    assert seed_claims.DOC.read_text() == seed_claims.render(), "stale: run python -m bench run seed_claims"


def test_every_claim_has_a_verdict():
    for c in seed_claims.CLAIMS:
        said, verdict = c.check()
        assert said and any(w in verdict for w in ("holds", "wrong by", "depends", "not modelled", "not checked")), verdict
