"""The notebook glue: the extension object, the magics, the panel's actions and the banner.

The only subpackage that imports IPython or ipywidgets; it hands what the lower layers need (a cell
number, a profile directory, a restart callable) down to them.
"""
