"""Process boot: settings every process inherits, the start-up hook's file helpers, LMDeploy's
process start. The hook itself (``../startup.py``) stands on the top floor: it starts the package."""
