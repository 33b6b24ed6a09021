"""graphtop.engine.telemetry: what the engine says about itself, and everything that reads it back.

The schema (``events``), the in-process bus (``bus``), the trace codec (``codec``) and the recorder that
writes it (``recorder``), the trace reader and writer (``trace``), the counting rules every hit-rate and
padding number follows (``stats``), capture costs (``capture``), the trace summary (``summary``) and its
text (``report``), the Perfetto export (``perfetto``), and the endpoint that serves events to viewer
processes: its wire protocol (``protocol``), server (``server``), the viewers' commands
(``endpoint_commands``), the snapshot a late viewer starts from (``state_keeper``) and the private
folder endpoints live in (``runtime``).
Nothing here imports torch: the dashboard, the trace tools and a viewer in another process use this
package without paying for the inference stack. Events flow one way: engine -> bus -> {recorder,
endpoint -> viewers}; commands come back through the engine's one queue.
"""
