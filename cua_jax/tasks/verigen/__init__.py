"""VeriGen (ScaleCUA §3.2, App. B): verifiable task synthesis over live environments.

    proposer -> rule validator -> judger -> checker (dry run in a live environment)
        ^                                            |
        +---------------- fixer (bounded rounds) <---+

Every role has a programmatic implementation (templates, scripted checker) and an LLM
one (any OpenAI-compatible endpoint). Accepted tasks are OSWorld task JSON with a Python
judge and the validation record of ScaleCUA Table 5.
"""
