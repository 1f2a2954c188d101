"""The package version, in a module any layer can import (the versions every manifest records:
:func:`rmfast.cpu.versions`)."""

__version__ = "0.1.0"
