"""Decoding recorded CAN traffic, one frame at a time, in bounded memory.

- :mod:`canarchy.decode.dbc`: signals of a DBC through cantools (:class:`DbcDecoder`, :func:`load_dbc`);
- :mod:`canarchy.decode.j1939`: J1939 PGNs, SPNs, TP, DM1/DM2 (:class:`J1939Decoder`);
- :mod:`canarchy.decode.diagnostics`: UDS / OBD-II / KWP2000 over ISO-TP (:func:`describe_diagnostic_pdu`);
- :mod:`canarchy.decode.common`: warnings, value ranges, ID helpers.

Importing this package imports none of them (nor cantools); output shapes:
``docs/decoding.md``.
"""
