"""compile(): a model config and its schedule config -> the validated, packed program that both VMs
run. The one way in: lower -> assign -> validate (schedule/plan.py) -> pack."""
from __future__ import annotations

from megavm.schedule.assign import DEFAULT_STRATEGY
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.dlrm import DLRMConfig, DLRMSchedule
from megavm.schedule.ir import Program
from megavm.schedule.models import ModelConfig
from megavm.schedule.plan import plan, plan_program
from megavm.vm.pack import PackedProgram, pack


def compile(cfg: ModelConfig | DLRMConfig, sc: ScheduleConfig | DLRMSchedule | None = None) -> PackedProgram:
    """A decoder step (ModelConfig, ScheduleConfig) or a DLRM batch (DLRMConfig, DLRMSchedule).
    Raises ValidationError (naming every problem) for a program that could deadlock or race."""
    p = plan(cfg, sc).checked()
    return pack(p.program, p.queues)


def compile_program(program: Program, n_sms: int, strategy: str = DEFAULT_STRATEGY) -> PackedProgram:
    """A program built by another lowering (or by hand): assigned to n_sms queues, validated, packed."""
    p = plan_program(program, n_sms, strategy).checked()
    return pack(p.program, p.queues)
