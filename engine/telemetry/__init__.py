"""graphtop.engine.telemetry: what the engine says about itself while it serves.

The schema (``events``), the in-process bus (``bus``), the one fold of the event stream every reader is a
view over (``fold``, with ``fold_steps``, ``fold_requests``, ``tallies``, ``history``), capture costs
(``capture``) and recaptures (``recapture``), the value limits every event keeps (``value_limits``), the
trace codec (``codec``), the recorder that writes a trace as the engine runs (``recorder``) and the writer
of whole ones (``trace_writer``), the Prometheus metrics (``metrics``), and the endpoint that serves
events to viewer processes: its wire protocol (``protocol``), server
(``server``), the viewers' commands (``endpoint_commands``), the snapshot a late viewer starts from
(``state_keeper``) and the private folder endpoints live in (``runtime``). Reading a run back afterwards
(trace reader, summary, report, Perfetto, stats, the advisor's input) is engine/trace_tools/, which no
part of the engine imports.
Nothing here imports torch: the dashboard, the trace tools and a viewer in another process use this
package without paying for the inference stack. Events flow one way: engine -> bus -> {recorder,
endpoint -> viewers}; commands come back through the engine's one queue.
"""
