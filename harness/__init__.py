"""Test and benchmark harnesses shared by tests/ and bench/: a hostile-client server driver, the
step-stall probe and the JSON-prefix oracle. Not part of the installed package (the wheel ships
``tokenrails*`` only): they need the repository (its tests, a model server to start) and test-only
dependencies (httpx). Import as ``harness.<module>`` with the repository root on ``sys.path``.
"""
