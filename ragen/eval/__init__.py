"""Evaluation on fixed, versioned seed panels: success, pass@k, reward, response length and format errors per
tag, with 95% confidence intervals (docs/evaluation.md, "paper protocol")."""
