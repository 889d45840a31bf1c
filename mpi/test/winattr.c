/* Window names and attributes: MPI_Win_set_name/get_name; keyvals whose
 * attributes are set, replaced, found, deleted and deleted with the
 * window, each delete function called once with its value, also after
 * the keyval is freed. Prints "winattr: ok on N ranks". */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

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
	OK(MPI_Win_free_keyval(&k0));
	OK(MPI_Win_free_keyval(&k2));
	EXPECT(MPI_Win_free_keyval(&k2) == MPI_ERR_KEYVAL, "freeing an invalid keyval");
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("winattr: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
