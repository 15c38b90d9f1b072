"""The command-line tools (``fastrebalance demo|status|bench|chaos``), kept apart from the
library: nothing in ``fastrebalance``'s public API imports them, and they use the library
only through what an application could use."""
