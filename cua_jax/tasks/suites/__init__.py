"""Task suites: OSWorld-format task files with their scripted solutions."""
