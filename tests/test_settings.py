"""One definition of the settings (trainfit/setup.py) reaches every surface: the Python API (Request), every CLI
command that takes settings, the web API's schema and the web page. Adding a setting is one declaration (plus
the formula that reads it); these tests fail if any surface would need a second edit."""
import json

import pytest

from trainfit import api
from trainfit.setup import SETTINGS, Request, Setup

fastapi = pytest.importorskip("fastapi")




def test_every_setting_is_a_request_field_with_its_default():
    for s in SETTINGS:
        assert hasattr(Request(model="gpt2"), s.name)
        assert getattr(Request(model="gpt2"), s.name) == s.request_default


@pytest.mark.parametrize("command", ["estimate", "report"])
def test_every_setting_is_a_cli_option(cli, command):
    code, out, _ = cli(command, "--help")
    assert code == 0
    for s in SETTINGS:
        assert s.flag in out, f"{s.flag} missing from `trainfit {command} --help`"


def test_every_setting_is_in_the_web_schema_and_on_the_page():
    from fastapi.testclient import TestClient

    from trainfit.web.app import create_app

    client = TestClient(create_app())
    schema = client.get("/api/openapi.json").json()
    params = {p["name"] for p in schema["paths"]["/api/estimate"]["get"]["parameters"]}
    page = client.get("/").text
    for s in SETTINGS:
        assert s.name in params
        assert f'id="{s.name}"' in page


def test_reserve_the_setting_added_in_one_place(cli):
    """--reserve was added by one declaration in RunSettings and one use in the fit formula. Hand check: the
    headroom is GPU memory minus reserve minus peak, so 8 GiB instead of 1 GiB leaves exactly 7 GiB less."""
    base = ["estimate", "llama-3.2-1b", "--gpu", "H100-80GB", "--json"]
    _, a, _ = cli(*base)
    _, b, _ = cli(*base, "--reserve", "8")
    a, b = json.loads(a), json.loads(b)
    assert a["time"]["headroom"] - b["time"]["headroom"] == 7 * 2**30
    assert a["memory"]["peak"] == b["memory"]["peak"]
    web = api.analytic(Request(model="llama-3.2-1b", gpu="H100-80GB", reserve=8.0))
    assert web.time.headroom == b["time"]["headroom"]
    code, _, err = cli(*base, "--reserve", "-1")
    assert code == 2 and "--reserve" in err


def test_setup_rejects_what_the_definition_rejects():
    for bad in ({"batch": 0}, {"precision": "fp64"}, {"zero": 5, "dp": 2}, {"mode": "infer", "grad_accum": 2}):
        with pytest.raises(Exception) as e:
            Setup(**bad)
        assert "--" in str(e.value)
