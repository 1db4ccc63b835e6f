/* tokenrails._dfa_native -- placeholder module; the real functions land with their Python wrapper. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyMethodDef methods[] = {
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_dfa_native", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__dfa_native(void) { return PyModule_Create(&module); }
