"""graphtop.engine.telemetry: what the engine says about itself, and everything that reads it back.

The schema (``events``), the in-process bus (``bus``), the trace codec (``codec``) and the recorder that
writes it (``recorder``), the trace reader (``trace``), the counting rules every hit-rate and padding
number follows (``stats``), capture costs (``capture``), the trace summary (``summary``) and its text
(``report``), and the Perfetto export (``perfetto``).
Nothing here imports torch: the dashboard, the trace tools and a viewer in another process use this
package without paying for the inference stack. Events flow one way: engine -> bus -> {recorder,
viewers}.
"""
