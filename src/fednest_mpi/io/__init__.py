"""Input/output: HDF5 run files (:mod:`fednest_mpi.io.h5`) are the only HDF5 code in the package."""
