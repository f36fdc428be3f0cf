"""`trainfit explain SNAPSHOT`: a memory snapshot in torch's format (torch/cuda/memory.py _snapshot), attributed by
category. The snapshots here are the allocator simulator's (trainfit.alloc, c10's CUDACachingAllocator rule by
rule) replaying a hand-made step: every byte below is derived by hand from the allocator's rules, and torch's own
reader (torch/cuda/_memory_viz.py segsum, which checks that each segment's blocks add up) reads the same file."""
from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

import pytest
import torch

from trainfit.memory_snapshot import explain, load
from trainfit.trace.recorder import ACTIVATION, GRADIENT, OPTIMIZER_STATE, PARAMETER, TEMPORARY
from trainfit.trace.snapshot import snapshot_of

MiB = 1 << 20


def _r(mib, cat, phase, birth, death=None, module=""):
    n = int(mib * MiB)
    return SimpleNamespace(nbytes=n, cat=cat, phase=phase, birth=birth, death=death, module=module, stream=0,
                           shape=(n // 4,), dtype=torch.float32)


# W (weights, 12 MiB) and S (an optimizer state, 12 MiB) are resident: a 12 MiB segment each (>= kMinLargeAlloc
# 10 MiB: rounded to 2 MiB). The step (from event 2): A, an activation of 6 MiB, takes a kLargeBuffer 20 MiB segment
# (1 MiB < 6 MiB < 10 MiB), split: [A 6 | 14 free]; T (3 MiB, forward temporary) splits the 14 and dies, merging
# back; G, a 12 MiB gradient made by the backward, splits the 14: [A 6 | G 12 | 2 free]; D (1.5 MiB, an
# activation's gradient) finds the 2 MiB block, whose 0.5 MiB remainder is not > kSmallSize (1 MiB), so it is not
# split (should_split): D holds 2 MiB for its 1.5. The replay's second pass (the steady state) lays them out alike.
STEP = [_r(12, PARAMETER, "setup", 0), _r(12, OPTIMIZER_STATE, "setup", 1),
        _r(6, ACTIVATION, "forward", 2, 7, "model.layers.0.mlp"), _r(3, TEMPORARY, "forward", 3, 4, "model.norm"),
        _r(12, GRADIENT, "backward", 5), _r(1.5, TEMPORARY, "backward", 6, 8)]


def _snapshot(tmp_path, at):
    snap, live = snapshot_of(STEP, start=2, at=at)
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    return path, snap, live


def test_categories_fragmentation_and_rounding_of_a_hand_made_step(tmp_path):
    from torch.cuda._memory_viz import segsum

    _, snap, _ = _snapshot(tmp_path, at=5)  # G just made: 2 MiB free inside A's and G's segment
    ex = explain(snap)
    assert ex.reserved == 44 * MiB and ex.segments == 3 and ex.allocated == 42 * MiB
    assert {k: v for k, v in ex.bytes.items() if v} == {
        "weights": 12 * MiB, "optimizer_states": 12 * MiB, "activations": 6 * MiB, "gradients": 12 * MiB,
        "fragmented": 2 * MiB}
    assert "total_reserved: 44.0MiB" in segsum(snap) and "total_allocated: 42.0MiB" in segsum(snap)
    _, snap, _ = _snapshot(tmp_path, at=6)  # D takes the 2 MiB block whole: 0.5 MiB of rounding, no fragment
    ex = explain(snap)
    assert ex.bytes["temporaries"] == 1.5 * MiB and ex.bytes["rounding"] == MiB // 2 and ex.bytes["fragmented"] == 0
    assert ex.bytes["gradients"] == 12 * MiB  # G matches W's size; D matches no weight: a temporary
    assert ("model.layers.0.mlp:0:forward", "activations", 6 * MiB) in ex.by_site


def test_explain_command_reads_the_file(cli, tmp_path):
    path, _, _ = _snapshot(tmp_path, at=6)
    code, out, _ = cli("explain", str(path), "--json")
    d = json.loads(out)
    assert code == 0 and d["reserved"] == 44 * MiB and d["bytes"]["gradients"] == 12 * MiB
    code, out, _ = cli("explain", str(path))
    assert code == 0 and "gradients" in out and "--model" in out  # tells how to compare


def test_explain_compares_with_the_prediction_and_names_what_frees_most(cli, tmp_path):
    path, _, _ = _snapshot(tmp_path, at=6)
    code, out, _ = cli("explain", str(path), "--model", "tiny-llama", "--batch", "2", "--seq", "64", "--gpu", "T4",
                       "--json")
    d = json.loads(out)
    assert code == 0 and d["predicted"]["bytes"]["optimizer_states"] > 0 and d["frees_most"]
    frees = [x["frees"] for x in d["frees_most"]]
    assert frees == sorted(frees, reverse=True) and frees[0] > 0


@pytest.mark.parametrize("traces, says", [
    ([{"action": "oom"}], "device_traces are not a list of each device's list"),  # (AttributeError before)
    (5, "device_traces are not a list of each device's list"),  # (TypeError before)
    ([["oom"]], "device_traces are not a list of each device's list"),
    ([[{"action": "oom", "size": "3 MiB", "device_free": 0}]], "an oom entry's size is '3 MiB', not a byte count"),
])
def test_device_traces_not_as_torch_writes_them_are_one_line_and_exit_2(cli, tmp_path, traces, says):
    """torch/cuda/memory.py Snapshot: device_traces is a List[List[TraceEntry]], an oom entry's size and device_free
    byte counts; anything else was a traceback (exit 1)."""
    snap = _one_segment([(MiB, "active_allocated")])
    snap["device_traces"] = traces
    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, err = cli("explain", str(path))
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("change, says", [
    # torch/cuda/memory.py Block: one of three states (an unknown one was counted as a cached free block)
    (lambda b, seg: b.update(state="allocated"), "block 0's state is 'allocated', not one of active_allocated"),
    # requested_size <= size (a larger request gave a negative rounding, -3.50 KiB)
    (lambda b, seg: b.update(size=512, requested_size=4096), "block 0's requested_size 4096 is above its size 512"),
    # the blocks split their segment (more than it gave allocated 4.00 KiB of 1.00 KiB reserved)
    (lambda b, seg: seg.update(total_size=1024), "segment 0's blocks add up to 4096 bytes, not its total_size 1024"),
])
def test_blocks_outside_the_allocators_invariants_are_refused(cli, tmp_path, change, says):
    from torch.cuda._memory_viz import segsum

    snap = _one_segment([(4096, "active_allocated")])
    change(snap["segments"][0]["blocks"][0], snap["segments"][0])
    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, err = cli("explain", str(path))
    assert code == 2 and out == "" and says in err and len(err.strip().splitlines()) == 1, err
    if "total_size" in says:  # torch's own reader refuses it too
        snap["segments"][0]["stream"] = 0
        with pytest.raises(AssertionError, match="Segment size mismatch"):
            segsum(snap)


def test_a_snapshot_of_several_gpus_explains_one(cli, tmp_path):
    """torch writes each segment's device (torch/csrc/cuda/memory_snapshot.cpp segmentInfoToDict) and one trace per
    device: a process on two GPUs (device_map="auto") gave reserved 4.00 GiB, the two GPUs summed, against a
    prediction per GPU. The GPU that reserved the most is explained, with its own trace's OOM; the other is named."""
    def seg(device, n):
        return {"device": device, "total_size": n, "blocks": [{"size": n, "requested_size": n,
                                                               "state": "active_allocated", "frames": []}]}

    snap = {"segments": [seg(0, 1 << 30), seg(1, 3 << 30)],
            "device_traces": [[], [{"action": "oom", "size": 1 << 30, "device_free": MiB}]]}
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, _ = cli("explain", str(path), "--json")
    d = json.loads(out)
    assert code == 0 and (d["reserved"], d["allocated"], d["segments"]) == (3 << 30, 3 << 30, 1)
    assert d["oom"] == {"size": 1 << 30, "device_free": MiB}
    assert any("cuda:1 is explained" in n and "cuda:0 1.00 GiB" in n for n in d["notes"]), d["notes"]
    snap["segments"][0]["device"] = "cuda:0"
    path.write_bytes(pickle.dumps(snap))
    code, out, err = cli("explain", str(path))
    assert code == 2 and "segment 0's device is 'cuda:0'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content, says", [
    (b"not a pickle at all", "not a PyTorch memory snapshot pickle"),
    (pickle.dumps({"blocks": []}), "no 'segments' list"),
    (pickle.dumps({"segments": [{"total_size": 2}]}), "lacks total_size or blocks"),
    (pickle.dumps(SimpleNamespace(a=1)), "refers to types.SimpleNamespace"),  # a class: never loaded
    # frames not as torch writes them (a TypeError / AttributeError traceback before)
    (pickle.dumps({"segments": [{"total_size": 512, "blocks": [{"size": 512, "requested_size": 512,
                  "state": "active_allocated", "frames": "model.py:3"}]}]}), "block 0's frames are not a list"),
    (pickle.dumps({"segments": [{"total_size": 512, "blocks": [{"size": 512, "requested_size": 512,
                  "state": "active_allocated", "frames": [{"filename": "m.py", "line": 3, "name": None}]}]}]}),
     "block 0's frames are not a list"),
])
def test_bad_snapshot_files_are_one_line_and_exit_2(cli, tmp_path, content, says):
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    code, out, err = cli("explain", str(path))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1


def _one_segment(sizes_states, total=None):
    blocks = [{"size": n, "requested_size": n if st == "active_allocated" else 0, "state": st, "frames": []}
              for n, st in sizes_states]
    return {"segments": [{"total_size": sum(n for n, _ in sizes_states) if total is None else total,
                          "blocks": blocks}], "device_traces": [[]]}


def test_blocks_counts_the_allocated_blocks_only(cli, tmp_path):
    # 1 allocated block and 5 free ones in one segment: torch's segsum counts "active_allocated" blocks as allocated
    snap = _one_segment([(MiB, "active_allocated")] + [(MiB, "inactive")] * 4 + [(MiB, "active_awaiting_free")])
    ex = explain(snap)
    assert ex.blocks == 1 and ex.allocated == MiB and ex.reserved == 6 * MiB
    path = tmp_path / "frag.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, _ = cli("explain", str(path))
    assert code == 0 and "allocated 1.00 MiB in 1 blocks" in out.splitlines()[0]
    code, out, _ = cli("explain", str(path), "--json")
    assert code == 0 and json.loads(out)["blocks"] == 1


@pytest.mark.parametrize("total, size, says", [
    (-5, MiB, "segment 0's total_size is -5, not a byte count"),
    (1.5 * MiB, MiB, "segment 0's total_size is 1572864.0, not a byte count"),
    (MiB, -1, "segment 0 block 0's size is -1, not a byte count"),
    (MiB, True, "segment 0 block 0's size is True, not a byte count"),
])
def test_negative_or_non_integer_sizes_are_refused(cli, tmp_path, total, size, says):
    snap = _one_segment([(size, "active_allocated")], total=total)
    snap["segments"][0]["blocks"][0]["requested_size"] = 0
    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, err = cli("explain", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.strip() == (f"error: {path}: {says} (an int >= 0: torch/cuda/memory.py Segment, Block): save the "
                           "snapshot again with torch.cuda.memory._dump_snapshot(path)")


def test_an_empty_path_is_said_to_be_empty(cli):
    code, out, err = cli("explain", "")  # not ": a folder, not a file" (Path("") is the current folder)
    assert code == 2 and out == "" and err.strip() == (
        "error: '': the path is empty: give the path of a snapshot saved with torch.cuda.memory._dump_snapshot(path)")


def test_setup_flags_without_a_model_are_refused(cli, tmp_path):
    path, _, _ = _snapshot(tmp_path, at=6)
    code, _, err = cli("explain", str(path), "--batch", "4")
    assert code == 2 and "--model" in err


def test_host_memory_is_refused(cli, tmp_path):
    """explain sets the snapshot beside the predicted device memory and what frees the most of it (fit_advice.
    frees_most: Memory.required), none of which the node's host memory changes: --host-memory is refused."""
    path, _, _ = _snapshot(tmp_path, at=6)
    code, out, err = cli("explain", str(path), "--model", "tiny-llama", "--gpu", "T4", "--host-memory", "64")
    assert code == 2 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --host-memory is read by the analytic engine")
    assert "explain compares device memory" in err and err.strip().endswith("drop it")


def test_a_torch_save_of_the_snapshot_is_read_with_weights_only(tmp_path):
    _, snap, _ = _snapshot(tmp_path, at=6)
    torch.save(snap, tmp_path / "snap.pt")
    assert explain(load(tmp_path / "snap.pt")).reserved == 44 * MiB


def test_an_out_of_memory_observer_s_snapshot_says_what_failed(cli, tmp_path):
    # the observer's _snapshot() with history on ends in an "oom" entry (torch/cuda/memory.py TraceEntry): size
    # requested and device_free
    _, snap, _ = _snapshot(tmp_path, at=6)
    snap["device_traces"] = [[{"action": "alloc", "addr": 0, "size": 512, "stream": 0, "frames": []},
                              {"action": "oom", "size": 3 * MiB, "device_free": MiB, "stream": 0, "frames": []}]]
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(snap))
    code, out, _ = cli("explain", str(path))
    assert code == 0 and "out of memory: 3.00 MiB requested with 1.00 MiB free on the device" in out
