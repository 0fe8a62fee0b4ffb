"""Tasks (OSWorld JSON) for the osworld_apps image's applications: Chrome, GIMP and VLC, with scripted solutions."""
