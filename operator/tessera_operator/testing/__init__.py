"""Test support shipped with the operator: a stricter KMock API server and thread runners.

Imported only by tests and `tessera bench reconcile`, never by the operator itself;
needs the `dev` extra (kmock).
"""
