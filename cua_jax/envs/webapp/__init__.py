"""A stateful web application (Trac) in capsules: one shared application server, a private
copy-on-write branch of the seeded state per capsule generation, WebArena-format tasks judged on
the application's database. `runtime.py` says how; `tasks.py`, `judges.py` and `trac_state.py`
are the tasks, their judges and the seeded state."""
