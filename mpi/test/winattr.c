/* Window names, attributes and error handlers: MPI_Win_set_name/get_name;
 * keyvals whose attributes are set, replaced, found, deleted and deleted
 * with the window, each delete function called once with its value, also
 * after the keyval is freed; a program's error handler called by
 * MPI_Win_call_errhandler and by a failing call, with the window and the
 * class, also after its handle is freed. Prints "winattr: ok on N
 * ranks". */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

static int calls, last_code;
static MPI_Win last_win;

static void handler(MPI_Win *w, int *code, ...) {
	calls++;
	last_win = *w, last_code = *code;
}

static int deleted[4], last_key;
static void *last_val;

static int del(MPI_Win w, int key, void *val, void *extra) {
	(void)w;
	deleted[(int)(long)extra]++;
	last_key = key, last_val = val;
	return MPI_SUCCESS;
}

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	int buf[4];
	MPI_Win win;
	OK(MPI_Win_create(buf, sizeof buf, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	char name[MPI_MAX_OBJECT_NAME];
	int len = -1;
	OK(MPI_Win_get_name(win, name, &len));
	EXPECT(len == 0 && name[0] == 0, "default name %s", name);
	OK(MPI_Win_set_name(win, "halo window"));
	OK(MPI_Win_get_name(win, name, &len));
	EXPECT(len == 11 && strcmp(name, "halo window") == 0, "name %s (%d)", name, len);

	int k0, k1, k2, a = 1, b = 2, c = 3, *v = NULL, flag = -1;
	OK(MPI_Win_create_keyval(MPI_WIN_NULL_COPY_FN, del, &k0, (void *)0));
	OK(MPI_Win_create_keyval(MPI_WIN_NULL_COPY_FN, del, &k1, (void *)1));
	OK(MPI_Win_create_keyval(MPI_WIN_NULL_COPY_FN, MPI_WIN_NULL_DELETE_FN, &k2, (void *)2));
	EXPECT(k0 != k1 && k1 != k2, "keyvals %d %d %d", k0, k1, k2);
	OK(MPI_Win_get_attr(win, k0, &v, &flag));
	EXPECT(flag == 0, "an attribute never set");
	OK(MPI_Win_set_attr(win, k0, &a));
	OK(MPI_Win_set_attr(win, k1, &b));
	OK(MPI_Win_set_attr(win, k2, &c));
	OK(MPI_Win_get_attr(win, k1, &v, &flag));
	EXPECT(flag && v == &b, "k1: %d %p", flag, (void *)v);
	/* replacing calls the delete function on the old value */
	OK(MPI_Win_set_attr(win, k1, &c));
	EXPECT(deleted[1] == 1 && last_val == &b && last_key == k1, "replaced: %d", deleted[1]);
	OK(MPI_Win_get_attr(win, k1, &v, &flag));
	EXPECT(flag && v == &c, "k1 replaced: %p", (void *)v);
	/* the predefined attributes are still there */
	int *unit;
	OK(MPI_Win_get_attr(win, MPI_WIN_DISP_UNIT, &unit, &flag));
	EXPECT(flag && *unit == sizeof(int), "disp_unit");
	OK(MPI_Win_delete_attr(win, k0));
	EXPECT(deleted[0] == 1 && last_val == &a, "deleted: %d", deleted[0]);
	OK(MPI_Win_get_attr(win, k0, &v, &flag));
	EXPECT(flag == 0, "k0 after delete");
	EXPECT(MPI_Win_delete_attr(win, k0) == MPI_ERR_KEYVAL, "deleting twice");
	/* a freed keyval's attribute stays until the window goes */
	OK(MPI_Win_free_keyval(&k1));
	EXPECT(k1 == MPI_KEYVAL_INVALID, "freed keyval %d", k1);
	OK(MPI_Win_free(&win));
	EXPECT(deleted[1] == 2 && last_val == &c && deleted[0] == 1, "at MPI_Win_free: %d %d", deleted[0], deleted[1]);
	/* error handlers */
	for (int round = 0; round < 300; round++) { /* handles are reused */
		MPI_Errhandler eh, got;
		OK(MPI_Win_create(buf, sizeof buf, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win));
		OK(MPI_Win_create_errhandler(handler, &eh));
		OK(MPI_Win_set_errhandler(win, eh));
		OK(MPI_Errhandler_free(&eh));
		EXPECT(eh == MPI_ERRHANDLER_NULL, "freed handle");
		calls = 0;
		OK(MPI_Win_call_errhandler(win, MPI_ERR_OTHER));
		EXPECT(calls == 1 && last_win == win && last_code == MPI_ERR_OTHER, "call_errhandler: %d calls, code %d",
		       calls, last_code);
		int cls = MPI_Put(buf, 1, MPI_INT, np + 3, 0, 1, MPI_INT, win);
		EXPECT(cls == MPI_ERR_RANK && calls == 2 && last_code == MPI_ERR_RANK && last_win == win,
		       "a failing put: class %d, %d calls, code %d", cls, calls, last_code);
		OK(MPI_Win_get_errhandler(win, &got));
		OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
		OK(MPI_Win_set_errhandler(win, got)); /* still alive: got holds it */
		OK(MPI_Errhandler_free(&got));
		OK(MPI_Win_call_errhandler(win, MPI_ERR_ARG));
		EXPECT(calls == 3 && last_code == MPI_ERR_ARG, "after set again: %d calls", calls);
		OK(MPI_Win_free(&win));
	}
	OK(MPI_Win_free_keyval(&k0));
	OK(MPI_Win_free_keyval(&k2));
	EXPECT(MPI_Win_free_keyval(&k2) == MPI_ERR_KEYVAL, "freeing an invalid keyval");
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("winattr: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
