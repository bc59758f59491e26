package gateway_test

import "github.com/ferrymq/ferrymq/core/store/vfs"

func vfsCrash() *vfs.CrashFS { return vfs.NewCrashFS() }
