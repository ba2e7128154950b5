"""The compiler's pipeline: lower one step, assign its tasks to SM queues, validate both.
vm/compile.py packs what this plans; every caller goes through the two."""
from __future__ import annotations

from dataclasses import dataclass

from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
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


def plan(cfg: ModelConfig, sc: ScheduleConfig = ScheduleConfig()) -> Plan:
    return plan_program(lower(cfg, sc), sc.n_sms, sc.strategy)


def plan_program(program: Program, n_sms: int, strategy: str = "balanced") -> Plan:
    """Assign and validate a program built by any lowering (or by hand)."""
    queues = assign(program, n_sms, strategy)
    return Plan(program, queues, validate(program, queues))
