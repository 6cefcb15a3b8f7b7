"""Agent swarm with PARL rewards (K2.5 section 6): tool-call parsing, an orchestrator runtime with concurrent
sub-agents, wide/deep environments from the synthetic world, PARL rewards with annealing, latency metrics and
orchestrator training through :mod:`rl.objective`. See ``rl/swarm/README.md``."""
