"""One LMDeploy engine step with guided rows: agent, logits, sampling, the per-rank manager."""
