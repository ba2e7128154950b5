"""The megakernel's build: it compiles for sm_80 and sm_90a without a GPU (CI has nvcc, no GPU), its
cache key covers what changes the binary, and asking for the GPU VM without a GPU fails clearly."""
import shutil

import pytest
import torch

from vm import build

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not build.Path("/usr/local/cuda/bin/nvcc").exists(),
                                reason="nvcc is not installed on this machine")


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_megakernel_compiles(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAVM_CACHE_DIR", str(tmp_path))
    obj = build.build(arch, compile_only=True)
    assert obj.exists() and obj.stat().st_size > 10_000, f"{arch=} {obj}"
    assert build.build(arch, compile_only=True) == obj, "second build must come from the cache"
    assert not list(tmp_path.glob(".build-*")), "temporary files left behind"


@needs_nvcc
def test_cache_key_covers_defines_and_arch():
    k = build.cache_key("sm_90a")
    assert k == build.cache_key("sm_90a")
    assert k != build.cache_key("sm_80")
    assert k != build.cache_key("sm_90a", {"MVM_STAGES": 4})


def test_sources_cover_every_device_file():
    names = {p.name for p in build.sources()}
    assert {"megakernel.cu", "device.cuh", "gemv.cuh", "abi.h", "attention.cuh", "lm_head.cuh"} <= names


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_no_gpu_errors_are_clear(monkeypatch):
    from vm.megakernel import MegakernelVM
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*ReferenceVM"):
        MegakernelVM(None, {})
    monkeypatch.delenv("MEGAVM_ARCH", raising=False)
    with pytest.raises(build.BuildError, match="MEGAVM_ARCH"):
        build.device_arch()


def test_launch_flags_match_the_kernel():
    """The ablation flags megakernel.py sets are the bits device.cuh tests, name for name."""
    import re
    from vm import megakernel
    text = (build.ROOT / "vm" / "kernel" / "device.cuh").read_text()
    device = {m[0]: int(m[1]) for m in re.findall(r"MVM_FLAG_(\w+) = (\d+)u", text)}
    host = {k.removeprefix("FLAG_"): v for k, v in vars(megakernel).items() if k.startswith("FLAG_")}
    assert device == host, f"{device=} {host=}"
