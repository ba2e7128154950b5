"""megavm: a persistent cooperative megakernel VM for batch-1 decode.

    import megavm
    packed = megavm.compile(megavm.preset("tiny"), megavm.ScheduleConfig(dtype="f32", capacity=64))
    vm = megavm.ReferenceVM(packed, weights)          # or megavm.MegakernelVM on a GPU

The names below are handed on from the subpackages on first use, so importing one floor of megavm
(megavm.core, say) never loads the rest.
"""
from importlib import import_module as _import
from pathlib import Path as _Path

# In a source checkout the subpackages (core, instructions, schedule, vm, flywheel) are the folders
# beside this one; an installed megavm holds them inside this folder (pyproject.toml maps them).
if not (_Path(__file__).parent / "core").is_dir():
    __path__.append(str(_Path(__file__).resolve().parent.parent))

_PUBLIC = {
    "compile": "megavm.vm.compile", "ScheduleConfig": "megavm.schedule.config",
    "ModelConfig": "megavm.schedule.models", "preset": "megavm.schedule.models",
    "program_weights": "megavm.schedule.models", "load_model": "megavm.schedule.source",
    "ReferenceVM": "megavm.vm.reference", "MegakernelVM": "megavm.vm.megakernel", "Ablations": "megavm.vm.megakernel",
    "MegavmError": "megavm.core.errors", "UserError": "megavm.core.errors",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'megavm' has no attribute {name!r}")
    return getattr(_import(_PUBLIC[name]), name)
