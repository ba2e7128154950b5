"""The compiler's pipeline: lower one step, assign its tasks to SM queues, validate both.
vm/compile.py packs what this plans; every caller goes through the two."""
from __future__ import annotations

from dataclasses import dataclass

from megavm.core.errors import ConfigError
from megavm.schedule.assign import DEFAULT_STRATEGY, CostModel, assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.dlrm import DLRMConfig, DLRMSchedule, lower_dlrm
from megavm.schedule.fit import fit_chain
from megavm.schedule.ir import Program
from megavm.schedule.lower import lower
from megavm.schedule.models import ModelConfig
from megavm.schedule.validate import Report, ValidationError, validate


@dataclass
class Plan:
    program: Program
    queues: list[list[int]]
    report: Report                   # the validator's verdict on program and queues

    def checked(self) -> "Plan":
        """This plan, or ValidationError naming its problems."""
        if not self.report.ok:
            raise ValidationError(self.report)
        return self


def plan(cfg: ModelConfig | DLRMConfig, sc: ScheduleConfig | DLRMSchedule | None = None) -> Plan:
    """A decoder step (ModelConfig, ScheduleConfig) or a DLRM batch (DLRMConfig, DLRMSchedule)."""
    if isinstance(cfg, DLRMConfig):
        sc = sc or DLRMSchedule()
        if not isinstance(sc, DLRMSchedule):
            raise ConfigError(f"a DLRM program takes a DLRMSchedule, not {type(sc).__name__}")
        return plan_program(lower_dlrm(cfg, sc), sc.n_sms, sc.strategy)
    sc = sc or ScheduleConfig()
    if not isinstance(sc, ScheduleConfig):
        raise ConfigError(f"a decoder program takes a ScheduleConfig, not {type(sc).__name__}")
    return plan_program(lower(cfg, fit_chain(cfg, sc)), sc.n_sms, sc.strategy, CostModel.of(sc.cost))


def plan_program(program: Program, n_sms: int, strategy: str = DEFAULT_STRATEGY, cost: CostModel = CostModel()) -> Plan:
    """Assign and validate a program built by any lowering (or by hand)."""
    queues = assign(program, n_sms, strategy, cost)
    return Plan(program, queues, validate(program, queues))
