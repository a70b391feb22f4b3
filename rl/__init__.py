"""cudal2's RL loop: prompts, extraction, reward, executor, policy, GRPO training (trl).

Nothing here is imported by `import cudal2`; trl/transformers/ray load inside the functions that
need them. Run `python -m rl.train --help`.
"""
