/* builtin_image.S -- embeds the fat binary of the built-in kernels.
 *
 * Defines the two symbols that lib/builtin.h declares.  CS_BUILTIN_FATBIN
 * is the fat binary's path, a string that the build passes in: the file is
 * generated in the build directory (Makefile.am), which need not be the
 * source directory.  The symbols are hidden: the library uses them, and
 * does not export them. */
#ifndef CS_BUILTIN_FATBIN
#error "CS_BUILTIN_FATBIN (the path of the kernels' fat binary) is not defined"
#endif

	.section .rodata
	.balign 64
	.globl cs_builtin_image
	.hidden cs_builtin_image
	.type cs_builtin_image, %object
cs_builtin_image:
	.incbin CS_BUILTIN_FATBIN
cs_builtin_image_end:
	.size cs_builtin_image, cs_builtin_image_end - cs_builtin_image

	.balign 8
	.globl cs_builtin_image_size
	.hidden cs_builtin_image_size
	.type cs_builtin_image_size, %object
cs_builtin_image_size:
#if defined(__LP64__) || defined(_LP64)
	.quad cs_builtin_image_end - cs_builtin_image
	.size cs_builtin_image_size, 8
#else
	.long cs_builtin_image_end - cs_builtin_image
	.size cs_builtin_image_size, 4
#endif

/* No executable stack. */
	.section .note.GNU-stack, "", %progbits
