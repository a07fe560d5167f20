"""The joint budget solver: recompute on the whole step graph and paging, chosen together (CP-SAT)."""

from onnxplan.joint.lower import dag_recompute_pass, lower_joint
from onnxplan.joint.problem import Decisions, JointProblem, build_problem
from onnxplan.joint.solve import JointSchedule, solve_joint, solve_problem

__all__ = ["Decisions", "JointProblem", "JointSchedule", "build_problem", "dag_recompute_pass", "lower_joint",
           "solve_joint", "solve_problem"]
