"""What the test files share: the kits (support, fault_kit, broker_kit, ...) and the worker apps
(helpers/apps/); tests/ is on sys.path (pyproject's pythonpath).
"""
