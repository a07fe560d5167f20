"""The options several commands share, declared once (plan, run, bench, inspect import them).

Each is a typer parameter declaration: `order: str = ORDER` in a command's signature. Options
whose meaning differs between commands (--budget, --device, --json, --swap-dir, ...) stay
with their command.
"""

from __future__ import annotations

import typer

from onnxplan.budget.decide import DEFAULT_PROFILE

__all__ = [
    "BATCH", "CHECKPOINT", "DIM", "FREEZE", "INPLACE", "INTERLEAVE", "LOOKAHEAD", "LOSS", "MODEL", "OPTIMIZER",
    "ORDER", "PLANNER", "PROFILE", "SPLIT_GRAD", "STRATEGY", "SWAP", "THREADS", "THREADS_HELP", "TIME_LIMIT",
    "TRAIN", "WINDOW_BYTES",
]

THREADS_HELP = ("Threads for every pool of the process: numpy's BLAS, torch (intra-op; inter-op 1), "
                "OpenMP and each ONNX Runtime session (default: every core this process may use). "
                "README: Threads.")
_STRATEGY_HELP = ("With --budget, how to meet it: auto (default: the plain plan if it fits, else recompute or swap, "
                  "whichever fits predicted faster; within 10%, swap: onnxplan/budget/decide.py), recompute (rotor's "
                  "fastest checkpoint schedule "
                  "that fits), swap (the swap module's auto policy), joint (recomputation on the whole graph and "
                  "paging chosen together by the joint CP-SAT solver; opt-in: seconds per solve, --time-limit each; "
                  "`onnxplan explain` shows what it kept, recomputed and swapped per value).")

# ---- the model and how its step is made (inspect, plan, run; bench: --train/--freeze) ----------------
MODEL = typer.Argument(..., help="Zoo name, forward .onnx, or artifact folder.")
BATCH = typer.Option(None, "--batch", help="Batch size (zoo models; dynamic batch dims).")
DIM = typer.Option(None, "--dim", help="Value of a named dynamic dimension: NAME=INT.")
OPTIMIZER = typer.Option(None, "--optimizer", help="adamw or sgd (zoo / forward .onnx).")
LOSS = typer.Option(None, "--loss", help="ce, mse or causal-lm (default: the zoo model's; ce for a forward .onnx).")
TRAIN = typer.Option(None, "--train", help="Train only the initializers matching this glob (forward .onnx; repeatable).")
FREEZE = typer.Option(None, "--freeze", help="Freeze the initializers matching this glob (forward .onnx; repeatable).")

# ---- planning (plan, run; bench: --time-limit) --------------------------------------------------------
ORDER = typer.Option("auto", "--order", help="Execution order: auto, given, nntrainer, greedy, ilp.")
PLANNER = typer.Option("auto", "--planner", help="Offset planner: auto, naive, sort, greedy-size, best-fit, ilp.")
INTERLEAVE = typer.Option(True, "--interleave/--no-interleave", help="Update each parameter right after its gradient.")
INPLACE = typer.Option(True, "--inplace/--no-inplace", help="Let ops write into dying inputs (off: only optimizer and "
                       "running-statistics updates are in place).")
SPLIT_GRAD = typer.Option(False, "--split-grad", help="Split each ConvGrad into its dW half (reads X) and its dX half "
                          "(does not): X can die before dX is made, which lowers the working set of the backward pass "
                          "(same FLOPs, same numbers). With --budget and no policy named, tried when it helps.")
TIME_LIMIT = typer.Option(None, "--time-limit", help="Seconds for each ILP solve (given: the ILPs always run; default: "
                          "the offset ILP runs only when the heuristics leave a gap, for a budget scaled by the gap and "
                          "the graph size; --planner/--order ilp alone: 10 s).")

# ---- meeting a budget (plan, run) ---------------------------------------------------------------------
SWAP = typer.Option(None, "--swap", help="Swap policy: none, on-demand, reduced, proactive, adaptive, window (default: "
                    "none, or auto with --budget: swap only when order and planner alone miss it).")
LOOKAHEAD = typer.Option(1, "--lookahead", help="proactive: issue each swap-in N EOs ahead of its use.")
WINDOW_BYTES = typer.Option(None, "--window-bytes", help="window: prefetch window, e.g. 8MiB (default: the largest "
                            "working set).")
CHECKPOINT = typer.Option(None, "--checkpoint", help="Recompute instead of keeping activations: none, sqrt, chen, rotor "
                          "(with --budget: the fastest schedule that fits). With --budget and neither --checkpoint nor "
                          "--swap: recompute or swap, whichever fits predicted faster (within 10%: swap).")
STRATEGY = typer.Option("auto", "--strategy", help=_STRATEGY_HELP)
PROFILE = typer.Option(DEFAULT_PROFILE, "--profile/--no-profile", help="--checkpoint: time the stages by a short run of our "
                       "kernels (--no-profile: a FLOP estimate).")

# ---- running (run, bench) -----------------------------------------------------------------------------
THREADS = typer.Option(None, "--threads", help=THREADS_HELP)
