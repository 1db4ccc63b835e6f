"""Process boot: the start-up hook, settings every process inherits, LMDeploy's own CLI."""
