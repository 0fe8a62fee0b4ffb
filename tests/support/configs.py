"""Config helpers for tests."""


def flatten(d, prefix=""):
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def set_field(config, field, value):
    """Sets the config's field named by its dotted path ("sampler.dtac.p_low")."""
    *sections, name = field.split(".")
    for section in sections:
        config = config[section]
    config[name] = value
