"""Vision RL stage (K2.5 section 6): rollouts, verifiable rewards, the token-masked objective, the trainer."""
