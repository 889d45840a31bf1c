/*
 * mpix_rvma.h: what rvma adds to MPI, for programs built with rvmacc
 * (installed next to mpi.h; include it after mpi.h). Each call is one step
 * a code can take on its own, keeping the rest of its MPI code.
 *
 * Notified windows. The target says, when it creates the window, how many
 * bytes (or puts) complete an epoch, from all origins together or per
 * origin; MPIX_Win_wait_epoch returns when they have arrived, with the
 * data in the window's memory: no fence, no lock, no message. Origins put
 * with MPI_Put (and MPI_Rput) at any time, outside any MPI epoch; a put
 * from a rank the target does not expect fails with MPI_ERR_RMA_SYNC. The
 * window is otherwise an MPI window (MPI_Win_free frees it).
 *
 * Rewind. A notified window can keep its last completed epochs
 * (history); MPIX_Win_rewind rolls its memory back to one of them.
 *
 * Transport report. MPIX_Comm_transport says which provider (rvma's
 * transport) carries this rank's traffic to another rank: "shm" (shared
 * memory), "udp", "loop" (itself), or "" before anything connected them.
 */
#ifndef RVMA_MPIX_H
#define RVMA_MPIX_H

#include "mpi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPIX_RVMA 1

/* What a notified window counts (MPIX_Notify.count). */
#define MPIX_NOTIFY_BYTES 0
#define MPIX_NOTIFY_PUTS 1

/* A notified window's expectations; zeroed fields mean defaults. */
typedef struct MPIX_Notify {
	/* Bytes (or puts) per epoch from all origins together, used when
	 * nfrom is 0. */
	MPI_Count expect;
	/* Or per origin: nfrom ranks of the window's communicator and what
	 * each must put per epoch (each origin has its own counter, so one
	 * that runs ahead never completes the target's current epoch). Read
	 * during the call only. */
	int nfrom;
	const int *from_ranks;
	const MPI_Count *from_counts;
	/* MPIX_NOTIFY_BYTES (default) or MPIX_NOTIFY_PUTS (each contiguous
	 * run of target bytes of a put counts one). */
	int count;
	/* Epochs an origin may run ahead of the target (default 2, 1..64). */
	int depth;
	/* Completed epochs kept for MPIX_Win_rewind (default 0). */
	int history;
} MPIX_Notify;

/* Collective, as MPI_Win_allocate and MPI_Win_create, with expectations
 * cfg (not NULL; each rank its own). Displacements are in disp_unit as in
 * MPI; counts are bytes of the target window (or puts). */
int MPIX_Win_allocate_notified(MPI_Aint size, int disp_unit, const MPIX_Notify *cfg, MPI_Info info, MPI_Comm comm,
                               void *baseptr, MPI_Win *win);
int MPIX_Win_create_notified(void *base, MPI_Aint size, int disp_unit, const MPIX_Notify *cfg, MPI_Info info,
                             MPI_Comm comm, MPI_Win *win);

/* Waits until this rank's next epoch is complete; *epoch (may be NULL)
 * is its number, 1 for the first. */
int MPIX_Win_wait_epoch(MPI_Win win, MPI_Count *epoch);
/* Without blocking: *flag 1 and the epoch consumed if it was complete. */
int MPIX_Win_test_epoch(MPI_Win win, int *flag, MPI_Count *epoch);
/* Epochs completed and waited for so far. */
int MPIX_Win_epoch(MPI_Win win, MPI_Count *epoch);
/* Discards the current, partial epoch (when no origin is putting). */
int MPIX_Win_abandon_epoch(MPI_Win win);
/* Rolls the window's memory back k >= 1 completed epochs (1: the last
 * one, as it was when it completed); *epoch (may be NULL) is the epoch it
 * is now at. MPI_ERR_RMA_RANGE when the history does not reach that far;
 * MPI_ERR_RMA_SYNC on a window that is not notified. */
int MPIX_Win_rewind(MPI_Win win, int k, MPI_Count *epoch);

#define MPIX_MAX_TRANSPORT_NAME 16
/* The provider between this rank and rank of comm, into name (at least
 * MPIX_MAX_TRANSPORT_NAME bytes); *resultlen its length (0: not connected
 * yet). */
int MPIX_Comm_transport(MPI_Comm comm, int rank, char *name, int *resultlen);

#ifdef __cplusplus
}
#endif

#endif /* RVMA_MPIX_H */
