package main

/*
#include "helpers.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/rma"
	"github.com/rvma/rvma/verbs"
)

// Error codes of rvma.h's rvma_error.
const (
	codeOK = iota
	codeArg
	codeHandle
	codeRank
	codeBounds
	codeEpoch
	codeSync
	codeDatatype
	codePeer
	codeRemote
	codeClosed
	codeBootstrap
	codeState
	codeNotRetained
	codeRefused
	codeTruncate
	codeTimeout
	codeUnsupported
	codeResource
	codeOther
	codeCancelled
)

// apiError is an error of this layer's own checks, with its code.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func errorf(code int, format string, args ...any) error {
	return &apiError{code: code, msg: fmt.Sprintf(format, args...)}
}

// codes maps rma's sentinels (and those of the layers below that reach
// the caller) to codes, most specific first: an error may wrap several
// (ErrPeer wrapping a verbs error, for one).
var codes = []struct {
	err  error
	code int
}{
	{rma.ErrOutOfBounds, codeBounds},
	{rma.ErrNoEpoch, codeEpoch},
	{rma.ErrSync, codeSync},
	{rma.ErrDatatype, codeDatatype},
	{rma.ErrRank, codeRank},
	{rma.ErrRemote, codeRemote},
	{rma.ErrPeer, codePeer},
	{rma.ErrBootstrap, codeBootstrap},
	{rma.ErrNotRetained, codeNotRetained},
	{mailbox.ErrRefused, codeRefused},
	{rma.ErrClosed, codeClosed},
	{verbs.ErrUnsupported, codeUnsupported},
	{rma.ErrNotShared, codeUnsupported},
	{rma.ErrAttach, codeArg},
	{context.DeadlineExceeded, codeTimeout},
	{context.Canceled, codeCancelled}, // rvma_msg_cancel's, the only cancel
}

func codeOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return codeOther
}

// fail records err as the calling thread's last error and returns its code
// (C.int, what every export returns). The message goes to C's
// thread-local buffer: this runs on the C caller's thread.
func fail(err error) C.int {
	msg := err.Error()
	C.rvma__set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	return C.int(codeOf(err))
}

// result is fail for a possibly nil error.
func result(err error) C.int {
	if err == nil {
		return codeOK
	}
	return fail(err)
}
