"""The public ``Engine``'s methods by concern: what callers ask of it (requests.py) and how they steer
it while it serves (controls.py). Each module is a mixin of ``Engine`` (engine/engine.py), which holds
the state; the methods here only claim ids and queue commands that the step loop applies."""
