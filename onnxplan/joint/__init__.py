"""The joint budget solver: recompute on the whole step graph and paging, chosen together (CP-SAT)."""

from onnxplan.checkpoint.dag import dag_recompute_pass
from onnxplan.joint.fit import plan_joint
from onnxplan.joint.lower import lower_joint, lower_swaps
from onnxplan.joint.problem import Decisions, JointProblem, build_problem
from onnxplan.joint.solve import JointSchedule, schedule_summary, solve_joint, solve_problem

__all__ = ["Decisions", "JointProblem", "JointSchedule", "build_problem", "dag_recompute_pass", "lower_joint",
           "lower_swaps", "plan_joint", "schedule_summary", "solve_joint", "solve_problem"]
