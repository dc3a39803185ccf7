"""schedules: the formats that cross stages (Collective, Schedule, Plan), their checks, costs and bounds."""

from schedules.collectives import COMBINING, NAMES, ROOTED, Collective, CollectiveError
from schedules.schedule import (
    FORMAT,
    Schedule,
    ScheduleError,
    ScheduleMeta,
    Send,
    Step,
    dumps_schedule,
    load_schedule,
    parse_schedule,
    save_schedule,
)

__all__ = [
    "COMBINING",
    "NAMES",
    "ROOTED",
    "Collective",
    "CollectiveError",
    "FORMAT",
    "Schedule",
    "ScheduleError",
    "ScheduleMeta",
    "Send",
    "Step",
    "dumps_schedule",
    "load_schedule",
    "parse_schedule",
    "save_schedule",
]
