"""Colours of the dashboard, one place: prefill and decode keep their colours on every panel.

Prefill is warm (amber), decode is cool (blue); a step that mixes both is violet, the blend.
"""

from __future__ import annotations

PREFILL = "#ff9f1c"
DECODE = "#3a86ff"
MIXED = "#b56cff"
IDLE = "#2a2f3a"

RUNNING = "#2ec4b6"
WAITING = "#ffbf69"
PREEMPTED = "#ef476f"
KV = "#90be6d"

SM_ACTIVE = "#06d6a0"
TENSOR_ACTIVE = "#00bbf9"
GPU_UTIL = "#8d99ae"
DRAM_BW = "#f15bb5"
POWER = "#fee440"

BUDGET = "#e0e0e0"
ALLOWANCE = "#a6e22e"    # the autopilot: its prefill allowance, its predicted step time
STEP_ACTUAL = "#6f7f99"  # the actual step time the prediction is set against
MARKER = "#c0c0c0"
PHASE = "#80ffdb"        # a phased workload's phase starts, on the time axis
AXIS = "#6c7689"
LABEL = "#9aa5b8"
PANEL_BG = "#11151c"
TITLE = "#d8dee9"

MODE_COLOURS = {"continuous": PREFILL, "chunked": MIXED}
AB_COLOURS = {"A": "#4cc9f0", "B": "#f72585"}
