"""Built-in rule reward functions, each ``compute_score(data_source, solution_str,
ground_truth, extra_info=None, **kwargs) -> float | dict`` (verl's signature).

They import nothing heavy at module level (``math_verify`` is imported on first use),
so reward worker processes start fast.
"""
