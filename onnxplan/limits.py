"""Solver limits shared by every stage that runs a solver (orders, offsets, swap, joint): defined
once here, below them all (planning re-exports it as planning.DEFAULT_TIME_LIMIT)."""

__all__ = ["DEFAULT_TIME_LIMIT"]

DEFAULT_TIME_LIMIT = 10.0  # seconds for an ILP / CP-SAT solve the user asked for without --time-limit
