package rma

import "os"

var osUnsetenv = os.Unsetenv
