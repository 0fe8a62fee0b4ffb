"""cua_jax.environments: the `AgentEnvironment`s the agent loop drives, each over a kind of task
(capsule_env: MiniWoB++ capsules; desktop_env: OSWorld-format tasks on pooled desktops;
code_env: Python repositories in containers). They sit above cua_jax.tasks (task formats,
judges) and cua_jax.envs (actions, the contract, faults, runtimes)."""
