"""The HTTP server that runs inside an environment, speaking OSWorld's protocol.

Run inside the desktop image as `python3 -m cua_jax.envs.server --socket PATH
--start-display`. Standard library plus python3-xlib only: the image carries this
package and `cua_jax/envs/actions.py`, nothing else of the project.
"""
