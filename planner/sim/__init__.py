"""Fleet simulator and trace replay: simulated vLLM engines that emit real FPM, a router and scale actions with
start-up delays, trace readers, baseline policies, the hindsight oracle, metrics and the report.

Modules: timing (step timer), engine (one engine), fleet (replicas, router), fleet_config, replica (replica and
scale-event records), sinks (where FPM go), traces, policies, replay (driver, oracle, fixed-peak search), metrics,
report, realtime (wall-clock driver for the demo), replay_cli, bench. See docs/simulator.md.
"""

__all__: list[str] = []
