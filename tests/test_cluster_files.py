"""--cluster: a catalog name or a user's TOML file with the catalog's fields (trainfit/cluster.py), refused with one
line (exit 2) where it is wrong, a catalog name only under references.catalog_only (the web app)."""
import json

import pytest

from trainfit.cluster import catalog, resolve_cluster, with_cluster
from trainfit.errors import GPUFileError, SetupError
from trainfit.hardware import get_gpu
from trainfit.references import catalog_only


def _dp_comm(cli, *extra) -> float:
    code, out, err = cli("estimate", "llama-3.2-1b", "--gpu", "H100-80GB", "--dp", "16", "--json", *extra)
    assert code == 0, err
    return json.loads(out)["detail"]["step_time"]["dp_comm_total"]


def test_a_file_like_the_usual_node_times_as_the_gpu_alone(tmp_path, cli):
    # gpus.json's H100-80GB: 8 per node, one 400 Gb/s NIC each, NVLS: the same as no --cluster
    f = tmp_path / "mine.toml"
    f.write_text("gpus_per_node = 8\nnics = 8\nnic_bandwidth = 50e9\nnvls = true\n")
    assert _dp_comm(cli, "--cluster", str(f)) == pytest.approx(_dp_comm(cli))
    assert _dp_comm(cli, "--cluster", "dgx-h100") == pytest.approx(_dp_comm(cli))


def test_half_the_rails_slow_the_data_parallel_group(tmp_path, cli):
    # 4 NICs for 8 GPUs: each GPU's share is half a NIC. The 16-rank group (8 a node, 2 nodes) all-reduces its
    # gradients by NVLS-tree on the usual node, 5/6 x min(NVLink 369.9, 8 x 50) GB/s; on half the rails NVLS-tree
    # falls to 5/6 x 200 and the tree, each byte once up and down, 0.92 x min(369.9, 2 x 4 x 25) / 2 = 170 GB/s,
    # is faster (tuning.cc:275, 281, 324-325 at v2.27.5-1): the gradients' all-reduce takes 308.25 / 170.15 as long
    f = tmp_path / "half.toml"
    f.write_text("gpus_per_node = 8\nnics = 4\nnic_bandwidth = 50e9\nnvls = true\n")
    gpu = with_cluster(get_gpu("H100-80GB"), resolve_cluster(str(f)))
    assert gpu.inter_node_bandwidth == 25e9 and gpu.gpus_per_node == 8
    ratio = (5 / 6 * 369.9) / (0.92 * 369.9 / 2)
    assert _dp_comm(cli, "--cluster", str(f)) == pytest.approx(_dp_comm(cli) * ratio, rel=0.01)


@pytest.mark.parametrize("text, says", [
    ("gpus_per_node = 8\nnics = 8\nnvls = true\n", "missing field 'nic_bandwidth'"),
    ("gpus_per_node = 8\nnics = 8\nnic_bandwidth = 400\nnvls = true\n", "too small for bytes/s"),
    ("gpus_per_node = 0\nnics = 8\nnic_bandwidth = 50e9\nnvls = true\n", "'gpus_per_node' must be a positive"),
    ("gpus_per_node = 8\nnics = 8\nnic_bandwidth = 50e9\nnvls = 1\n", "'nvls' must be true or false"),
    ("gpus_per_node = 8\nnic = 8\nnic_bandwidth = 50e9\nnvls = true\n", "did you mean nics"),
    ("gpus_per_node = 8\nnics = 8\nnic_bandwidth = 50e9\nnvls = true\ngpus = ['A100-80GB']\n", "holds A100-80GB"),
    # a name the catalog does not know, refused where the file is read, with the catalog's nearest names
    ("gpus_per_node = 8\nnics = 8\nnic_bandwidth = 50e9\nnvls = true\ngpus = ['H100-80GBX']\n",
     "field 'gpus': unknown GPU 'H100-80GBX'. Did you mean: H100-80GB"),
])
def test_a_wrong_file_is_one_line(tmp_path, cli, text, says):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    code, _, err = cli("estimate", "llama-3.2-1b", "--gpu", "H100-80GB", "--cluster", str(f))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_files_gpus_read_as_the_catalog_names_them(tmp_path):
    # another case of a catalog name holds the same GPU: the node takes --gpu H100-80GB
    f = tmp_path / "mine.toml"
    f.write_text("gpus_per_node = 8\nnics = 8\nnic_bandwidth = 50e9\nnvls = true\ngpus = ['h100-80gb']\n")
    cluster = resolve_cluster(str(f))
    assert cluster.gpus == ("H100-80GB",)
    assert with_cluster(get_gpu("H100-80GB"), cluster).gpus_per_node == 8


def test_names_and_needs():
    with pytest.raises(SetupError, match="did you mean|Did you mean: dgx-h100"):
        resolve_cluster("dgx-h10")
    with pytest.raises(GPUFileError, match="not found"):
        resolve_cluster("/nowhere/mine.toml")
    with pytest.raises(SetupError, match="holds A100-80GB, A100-40GB, not the H100-80GB"):
        with_cluster(get_gpu("H100-80GB"), resolve_cluster("dgx-a100"))
    nvl72 = with_cluster(get_gpu("GB200"), resolve_cluster("gb200-nvl72"))
    assert nvl72.gpus_per_node == 72 and nvl72.inter_node_bandwidth == 50e9


def test_the_web_takes_catalog_names_only(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text("gpus_per_node = 8\nnics = 8\nnic_bandwidth = 50e9\nnvls = true\n")
    with catalog_only("catalog models", "catalog GPUs"):
        assert resolve_cluster("DGX-H100") is catalog()["dgx-h100"]
        with pytest.raises(SetupError, match="unknown cluster; give one of dgx-a100"):
            resolve_cluster(str(f))  # an existing file: refused without reading it
