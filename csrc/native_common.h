/* Helpers shared by the tokenrails C modules. Header-only: each module is its own extension. */
#ifndef TOKENRAILS_NATIVE_COMMON_H
#define TOKENRAILS_NATIVE_COMMON_H

#include <Python.h>

/* A METH_FASTCALL entry point's argument count: TypeError naming the call and both counts. */
static inline int check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (nargs == want) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", usage, want, nargs);
    return -1;
}

#endif
