"""Desktop tasks (OSWorld JSON) for the Docker desktop image, with scripted solutions."""
