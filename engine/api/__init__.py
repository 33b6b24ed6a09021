"""The public ``Engine``'s methods by concern, as parts it owns and delegates to: what callers ask of it
(requests.py) and how they steer it while it serves (controls.py). The methods only check their
arguments, claim ids and queue commands that the step loop applies."""
