"""Recovering a pruned model's quality: logit distillation from its parent."""
