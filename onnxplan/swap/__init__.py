"""Swap: evict buffers between two uses (on-demand, reduced, proactive, adaptive, window) to meet a budget."""

from onnxplan.swap.driver import AUTO_POLICIES, SWAP_CHOICES, Floor, SwapOutcome, plan_swaps, swap_totals
from onnxplan.swap.insert import SWAP_DOMAIN, SwappedValue, is_swap_node, rewrite_graph
from onnxplan.swap.model import SWAP_MIN_BYTES, Gap, Group, SwapModel, swap_model
from onnxplan.swap.policies import SWAP_POLICIES, SwapPolicy, make_policy
from onnxplan.swap.verify import verify_swaps

__all__ = ["AUTO_POLICIES", "SWAP_CHOICES", "SWAP_DOMAIN", "SWAP_MIN_BYTES", "SWAP_POLICIES", "Floor", "Gap",
           "Group", "SwapModel", "SwapOutcome", "SwapPolicy", "SwappedValue", "is_swap_node", "make_policy",
           "plan_swaps", "rewrite_graph", "swap_model", "swap_totals", "verify_swaps"]
