"""The megakernel's build: it compiles for sm_80 and sm_90a without a GPU (CI has nvcc, no GPU), its
cache key covers what changes the binary, and asking for the GPU VM without a GPU fails clearly."""
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from megavm.vm import build

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not build.Path("/usr/local/cuda/bin/nvcc").exists(),
                                reason="nvcc is not installed on this machine")


# The knob builds that must compile too: the NVFP4 KV cache's (MegakernelVM picks MVM_KV_E2M1 by the cache's
# head_dim), the 9-warp block (MVM_REG_SPLIT=0, the ablation), the 4-bit GEMVs without held activations
# (MVM_XREG=0, the ablation), without NVFP4 on e4m3 tensor cores (MVM_E2M1_F8=0, the ablation) and int4 on the
# integer tensor cores on every tile, in x's place and with their group tables read from L2 (MVM_U4_IMMA=1,
# MVM_U4_IMMA_LONG=1; MVM_U4_TAB_AHEAD=0: the ablation; one build); the default build alone would not
# catch their code rotting.
IMMA_ALL = {"MVM_U4_IMMA": 1, "MVM_U4_IMMA_LONG": 1, "MVM_U4_TAB_AHEAD": 0}
KNOB_BUILDS = [{"MVM_KV_E2M1": 64}, {"MVM_KV_E2M1": 128}, {"MVM_REG_SPLIT": 0}, {"MVM_XREG": 0}, {"MVM_E2M1_F8": 0},
               IMMA_ALL]
# Of those, the builds the docs say spill nothing (the 4-bit GEMV paths' A/B and research builds), held to it as
# the default is.
SPILL_FREE = [{"MVM_XREG": 0}, {"MVM_E2M1_F8": 0}, IMMA_ALL]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Every compile-only build the tests below check, compiled side by side into one cache (one after another
    they took about 5 of CI's 10 minutes), each keeping its ptxas report: (cache dir, {(arch, set line): path})."""
    cache = tmp_path_factory.mktemp("builds")
    jobs = [("sm_80", None), ("sm_90a", None)] + [("sm_90a", d) for d in KNOB_BUILDS]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEGAVM_CACHE_DIR", str(cache))
        mp.setenv("MEGAVM_BUILD_VERBOSE", "1")
        with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:   # nvcc processes
            futures = {(a, build.set_line(d)): pool.submit(build.build, a, d, True) for a, d in jobs}
            objs = {k: f.result() for k, f in futures.items()}
    return cache, objs


def assert_no_spills(obj) -> None:
    """ptxas -v's report of a build (build.report) names mvm_megakernel and no function that spills."""
    log = build.report(obj).read_text()
    spills = re.findall(r"Function properties for (\S+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                        r"(\d+) bytes spill loads", log)
    assert any(f == "mvm_megakernel" for f, *_ in spills), log[-2000:]
    spilled = [(f, int(st), int(ld)) for f, _, st, ld in spills if int(st) or int(ld)]
    assert not spilled, f"functions that spill (name, store bytes, load bytes): {spilled}"


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_megakernel_compiles(arch, compiled, monkeypatch):
    """sm_90a's build, with ptxas -v, spills nothing in any function: the 12-warp block (MVM_REG_SPLIT)
    gives the consumers 224 registers, and a change that spills again should be seen and measured
    (docs/performance.md, "Why 168")."""
    cache, objs = compiled
    monkeypatch.setenv("MEGAVM_CACHE_DIR", str(cache))
    obj = objs[(arch, "-")]
    assert obj.exists() and obj.stat().st_size > 10_000, f"{arch=} {obj}"
    assert build.build(arch, compile_only=True) == obj, "second build must come from the cache"
    if arch == "sm_90a":
        assert_no_spills(obj)
    assert not list(cache.glob(".build-*")), "temporary files left behind"


@needs_nvcc
@pytest.mark.parametrize("defines", KNOB_BUILDS)
def test_megakernel_compiles_with_the_knobs_it_is_built_with(defines, compiled):
    """Each knob build (KNOB_BUILDS) compiles, into its own cache entry; those in SPILL_FREE spill nothing."""
    cache, objs = compiled
    obj = objs[("sm_90a", build.set_line(defines))]
    assert obj.exists() and obj.stat().st_size > 10_000, f"{defines=} {obj}"
    assert obj.name == f"megavm-sm_90a-{build.cache_key('sm_90a', defines)}.o", "the knob's own cache entry"
    if defines in SPILL_FREE:
        assert_no_spills(obj)


@needs_nvcc
def test_the_register_split_refuses_a_consumer_count_it_cannot_fit(tmp_path, monkeypatch):
    """setmaxnreg's 56 / 224 fit 8 consumer warps only: with 16 (a count the ring's stages allow), the
    consumers would wait for registers forever, so the build stops at a static_assert naming the knob
    before any kernel could hang."""
    monkeypatch.setenv("MEGAVM_CACHE_DIR", str(tmp_path))
    with pytest.raises(build.BuildError, match="MVM_REG_SPLIT is set for 8 consumer warps"):
        build.build("sm_90a", defines={"MVM_CONSUMER_WARPS": 16}, compile_only=True)


@needs_nvcc
def test_cache_key_covers_defines_and_arch():
    k = build.cache_key("sm_90a")
    assert k == build.cache_key("sm_90a")
    assert k != build.cache_key("sm_80")
    assert k != build.cache_key("sm_90a", {"MVM_STAGES": 4})


def test_sources_cover_every_device_file():
    """The cache key hashes every file the kernel's includes can reach."""
    names = {str(p.relative_to(build.ROOT)) for p in build.sources()}
    on_disk = {str(p.relative_to(build.ROOT)) for d in ("core", "instructions", "vm/kernel")
               for p in (build.ROOT / d).glob("*") if p.suffix in (".h", ".cuh", ".cu")}
    assert names == on_disk, f"only hashed: {names - on_disk}, never hashed: {on_disk - names}"


def test_no_out_of_line_function_takes_the_context():
    """No __noinline__ device function takes mvm_ctx (by reference or pointer): its address would escape
    to a call, and the whole context would live in local memory for the entire kernel, every opcode
    reading and writing its ring position there. Three SAMPLE helpers that took mvm_ctx& cost llama-1b
    about 1 us a GEMV task, 0.877 ms against 0.793 (H200; docs/performance.md, session 56). Out-of-line
    helpers take what they read by value (gemv_view, sample_view)."""
    found = []
    for f in build.sources():
        text = f.read_text()
        for m in re.finditer(r"__noinline__", text):
            head = re.split(r"[{;]", text[m.end():], maxsplit=1)[0]       # the declaration up to its body
            if re.search(r"\bmvm_ctx\b", head):
                found.append(f"{f.relative_to(build.ROOT)}: {' '.join(head.split())[:90]}")
    assert not found, f"out-of-line functions taking mvm_ctx: {found}"


# The kernel body's local-memory loads and stores in PTX (sm_90a, 8380 floats of xs, 12 stages: llama-1b's
# build): 128 at 6611044, 148 at 9713319 (the loader's expert ids, sincosf's slow path), 678 at 99a5105,
# whose context lived in local memory. The bound sits between.
BODY_LOCAL_ACCESSES = 300


@needs_nvcc
def test_the_context_stays_in_registers(tmp_path):
    """Whatever takes the context's address out of line (an out-of-line callee, a pointer kept past a call),
    the compiler keeps the whole mvm_ctx in local memory for the entire kernel, and every opcode pays for
    it; ptxas counts none of it as a spill. The kernel body's ld.local / st.local in the PTX show it
    (about 15 s of nvcc, no ptxas)."""
    out = tmp_path / "megakernel.ptx"
    lib = build.flags("sm_90a", {"MEGAVM_MAX_K": 8380, "MVM_STAGES": 12})     # the library's flags, as PTX
    cmd = [build.nvcc()] + [f for f in lib if f not in ("-shared", build.gencode("sm_90a"))] + \
        ["-ptx", "-arch=compute_90a", "-o", str(out), str(build.MAIN)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    body, n = False, 0
    for line in out.read_text().splitlines():
        if line.startswith((".visible .entry", ".entry", ".func", ".visible .func", ".weak .func")):
            body = "mvm_megakernel" in line
        elif body and ("ld.local" in line or "st.local" in line):
            n += 1
    assert 0 < n <= BODY_LOCAL_ACCESSES, (
        f"the kernel body has {n} local-memory loads and stores in its PTX (at most {BODY_LOCAL_ACCESSES}; 148 at "
        "9713319): something keeps a large struct (the context?) in local memory (docs/performance.md, session 56)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_no_gpu_errors_are_clear(monkeypatch):
    from megavm.core.errors import BuildError
    from megavm.vm.megakernel import MegakernelVM
    with pytest.raises(BuildError, match="needs a CUDA GPU.*ReferenceVM"):
        MegakernelVM(None, {})
    monkeypatch.delenv("MEGAVM_ARCH", raising=False)
    with pytest.raises(build.BuildError, match="MEGAVM_ARCH"):
        build.device_arch()


def test_a_stale_generated_source_is_refused(tmp_path, monkeypatch):
    """A spec changed without regenerating would give the kernel wrong param indices: no build."""
    from megavm.vm import codegen
    monkeypatch.setattr(codegen, "opcodes_cuh", lambda: "// not what the specs give\n")
    monkeypatch.setitem(codegen.C_FILES, "instructions/opcodes.cuh", codegen.opcodes_cuh)
    monkeypatch.setenv("MEGAVM_CACHE_DIR", str(tmp_path))
    with pytest.raises(build.BuildError, match=r"stale.*instructions/opcodes.cuh.*megavm.vm.codegen"):
        build.build("sm_90a", compile_only=True)


def test_a_build_set_parses_each_build_once_and_refuses_a_bad_line():
    """--set's file: a line of NAME=VALUE words a build, '-' the default, '#' comments; the same knobs in
    another order are the same build; a word that is not NAME=VALUE names its line."""
    text = "# comment\n-\nMVM_STAGES=12 MEGAVM_MAX_K=8380\n\nMEGAVM_MAX_K=8380 MVM_STAGES=12  # again\n-\nMVM_E2M1_MMA=1\n"
    assert build.parse_set(text) == [{}, {"MVM_STAGES": "12", "MEGAVM_MAX_K": "8380"}, {"MVM_E2M1_MMA": "1"}]
    assert [build.set_line(d) for d in build.parse_set(text)] == ["-", "MEGAVM_MAX_K=8380 MVM_STAGES=12", "MVM_E2M1_MMA=1"]
    with pytest.raises(build.BuildError, match=r"line 2: 'MVM_STAGES=12 ring' is not NAME=VALUE"):
        build.parse_set("-\nMVM_STAGES=12 ring\n")
    with pytest.raises(build.BuildError, match="line 1"):
        build.parse_set("MVM_STAGES=\n")


def test_the_gpu_tests_build_set_names_only_knobs_the_build_has():
    """flywheel/gpu_builds.txt (what flywheel/gpu_check.sh compiles first) parses, and every name in it is
    a build knob or a capacity a build may size (core/limits.py): a misspelt knob would compile a build
    no test loads."""
    from megavm.core import limits
    names = {k.name for k in limits.KNOBS} | set(limits.BUILD_SIZED)
    sets = build.parse_set((build.ROOT / "flywheel" / "gpu_builds.txt").read_text())
    assert {} in sets and len(sets) > 4
    unknown = sorted({k for d in sets for k in d} - names)
    assert not unknown, f"not build knobs: {unknown}"
    assert all(v.isdigit() for d in sets for v in d.values())


def test_build_log_records_each_build_a_process_asks_for_once(tmp_path, monkeypatch):
    """MEGAVM_BUILD_LOG: every build() call appends its line (cached or compiled), each line once a process,
    in the form --set reads back."""
    log = tmp_path / "builds.txt"
    monkeypatch.setenv("MEGAVM_BUILD_LOG", str(log))
    monkeypatch.setenv("MEGAVM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_logged", set())
    monkeypatch.setattr(build, "cache_key", lambda arch, defines=None: build.set_line(defines).replace(" ", "_"))
    for d in ({"MVM_STAGES": 12, "MEGAVM_MAX_K": 8380}, None, {"MEGAVM_MAX_K": 8380, "MVM_STAGES": 12}):
        (tmp_path / f"megavm-sm_90a-{build.cache_key('sm_90a', d)}.so").write_bytes(b"")   # already built
        build.build("sm_90a", d)
    assert log.read_text() == "MEGAVM_MAX_K=8380 MVM_STAGES=12\n-\n"
    assert build.parse_set(log.read_text()) == [{"MEGAVM_MAX_K": "8380", "MVM_STAGES": "12"}, {}]


def test_build_set_compiles_every_line_with_the_extra_defines_and_fails_on_any(tmp_path, monkeypatch, capsys):
    """`python3 -m megavm.vm.build --set FILE --jobs N`: each line once, --define added to every line, and a
    failed build reported with its line and a non-zero exit, after the others."""
    calls = []

    def fake(arch, defines=None, compile_only=False):
        calls.append((arch, build.set_line(defines), compile_only))
        if defines.get("MVM_STAGES") == "99":
            raise build.BuildError("nvcc failed for sm_90a (exit 2): too many stages")
        return tmp_path / f"{build.set_line(defines)}.o"
    monkeypatch.setattr(build, "build", fake)
    f = tmp_path / "set.txt"
    f.write_text("-\nMVM_STAGES=12\nMVM_STAGES=12\n")
    assert build.main(["--arch", "sm_90a", "--set", str(f), "--jobs", "2", "--define", "MVM_TAG_SLEEP=0",
                       "--compile-only"]) == 0
    assert sorted(calls) == [("sm_90a", "MVM_STAGES=12 MVM_TAG_SLEEP=0", True), ("sm_90a", "MVM_TAG_SLEEP=0", True)]
    f.write_text("MVM_STAGES=99\nMVM_STAGES=12\n")
    assert build.main(["--arch", "sm_90a", "--set", str(f), "--jobs", "2"]) == 1
    err = capsys.readouterr().err
    assert "sm_90a (MVM_STAGES=99): nvcc failed" in err and "MVM_STAGES=12" not in err
    f.write_text("oops\n")
    with pytest.raises(SystemExit, match="line 1: 'oops' is not NAME=VALUE"):
        build.main(["--arch", "sm_90a", "--set", str(f)])
    with pytest.raises(SystemExit, match="--define MVM_STAGES: each must be NAME=VALUE"):
        build.main(["--arch", "sm_90a", "--define", "MVM_STAGES"])
