"""The format reward of the GRPO example, in TRL's reward-function form.

The reply must be the bare equation, `a * b = c` (a final period allowed) and nothing else. The base model writes
that form for about a third of the problems unprompted by any reward, so sampling finds it and GRPO can reinforce
it; a bare number, which the base model never writes, could not be found this way.
"""

from training_wizard.specs.verifiable import get_format_reward

equation_format = get_format_reward(r"\d+ \* \d+ = \d+\.?")
equation_format.__name__ = "equation_format"  # the name its metric is logged under: rewards/equation_format
