"""graphtop.engine.telemetry: what the engine says about itself, and everything that reads it back.

The schema (``events``), the in-process bus (``bus``), the trace codec and recorder (``recorder``), the
trace reader (``trace``), statistics over a trace (``report``) and the Perfetto export (``perfetto``).
Nothing here imports torch: the dashboard, the trace tools and a viewer in another process use this
package without paying for the inference stack. Events flow one way: engine -> bus -> {recorder,
viewers}.
"""
