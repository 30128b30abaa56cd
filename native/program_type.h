// ringreduce._native.Program: a program (program.h) as a Python object, decoded and
// validated once, when Python builds it (program_type.cpp). Issuer.run takes it, and
// PyInit__native (module.cpp) makes the type ready from the parts declared here.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "program.h"

namespace ringreduce {

struct PyProgram {
    PyObject_HEAD
    Program* program;  // owned; null until __init__ succeeds
};

extern PyTypeObject ProgramType;
extern PyMethodDef program_methods[];
extern PySequenceMethods program_seq;

int program_init(PyProgram* self, PyObject* a, PyObject* kw);
void program_dealloc(PyProgram* self);

// {op name: number} (a new reference): the module's OPS.
PyObject* op_numbers();

}  // namespace ringreduce
